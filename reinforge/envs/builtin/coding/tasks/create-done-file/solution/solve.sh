#!/bin/bash
set -e
cd /app
printf 'done\n' > notes.txt
