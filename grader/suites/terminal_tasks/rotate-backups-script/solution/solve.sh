#!/bin/bash
set -e
cat > /app/rotate.sh <<'SCRIPT'
#!/bin/bash
dir=$1 keep=$2
find "$dir" -maxdepth 1 -type f -name 'backup-*.tar.gz' -printf '%T@ %p\n' \
    | sort -rn | tail -n +"$((keep + 1))" | cut -d' ' -f2- \
    | while IFS= read -r f; do rm -f -- "$f"; done
exit 0
SCRIPT
