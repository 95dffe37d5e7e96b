#!/bin/bash
set -e
cd /app
printf 'HOST = "localhost"\nPORT = 9000\nTIMEOUT = 45\nRETRIES = 3\n' > config.py
git add config.py
git commit -q --no-edit
