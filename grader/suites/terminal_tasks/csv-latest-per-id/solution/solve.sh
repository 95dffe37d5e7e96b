#!/bin/bash
set -e
{
    head -n 1 /app/readings.csv
    tail -n +2 /app/readings.csv | sort -t, -k1,1 -k2,2r | gawk -F, '!seen[$1]++'
} > /app/latest.csv
