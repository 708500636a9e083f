#!/bin/bash
set -e
cd /app
printf 'Hello, sandbox!\n' > greeting.txt
