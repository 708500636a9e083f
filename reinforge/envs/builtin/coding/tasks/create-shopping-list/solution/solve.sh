#!/bin/bash
set -e
cd /app
printf 'milk\neggs\nbread\n' > shopping.txt
