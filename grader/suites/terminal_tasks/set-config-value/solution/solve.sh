#!/bin/bash
set -e
sed -i '/^\[server\]/,/^\[/ s/^port = 8000$/port = 8080/' /app/settings.ini
