#!/bin/bash
set -e
cat > /app/chext.sh <<'SCRIPT'
#!/bin/bash
dir=$1 old=$2 new=$3
for f in "$dir"/*."$old" "$dir"/.*."$old"; do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    mv -- "$f" "${f%."$old"}.$new"
done
exit 0
SCRIPT
