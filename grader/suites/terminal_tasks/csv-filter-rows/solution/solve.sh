#!/bin/bash
set -e
gawk -F, 'NR == 1 || $3 == "Engineering"' /app/employees.csv > /app/engineering.csv
