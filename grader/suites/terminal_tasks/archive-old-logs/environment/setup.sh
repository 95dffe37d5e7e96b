#!/bin/bash
# Modification times cannot travel as plain files: set them here (UTC).
set -e
cd /app/logs
touch -d '2023-10-31 12:00:00 UTC' web-2023-10.log
touch -d '2023-11-30 12:00:00 UTC' web-2023-11.log
touch -d '2023-12-15 12:00:00 UTC' web-2023-12.log
touch -d '2024-01-31 12:00:00 UTC' web-2024-01.log
touch -d '2024-02-29 12:00:00 UTC' web-2024-02.log
touch -d '2023-06-01 08:30:00 UTC' db.log
touch -d '2024-03-01 09:00:00 UTC' worker.log
touch -d '2022-01-01 00:00:00 UTC' notes.txt
touch -d '2023-05-05 05:05:05 UTC' web-2024-legacy.log
touch -d '2024-02-02 02:02:02 UTC' old-2022.log
