#!/bin/bash
set -e
# gawk, not awk: /usr/bin/awk is a Debian alternatives link through /etc, which a sandbox may not mount.
cut -d' ' -f1 /app/access.log | sort | uniq -c | sort -rn | head -3 | gawk '{print $1, $2}' > /app/top_ips.txt
