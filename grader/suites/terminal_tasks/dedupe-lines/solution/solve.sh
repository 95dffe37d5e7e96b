#!/bin/bash
set -e
gawk '!seen[$0]++' /app/urls.txt > /app/unique_urls.txt
