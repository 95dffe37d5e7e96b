#!/bin/bash
set -e
{
    echo "region,total"
    gawk -F, 'NR > 1 { sum[$2] += $4 } END { for (r in sum) printf "%s,%.2f\n", r, sum[r] }' /app/sales.csv | LC_ALL=C sort
} > /app/region_totals.csv
