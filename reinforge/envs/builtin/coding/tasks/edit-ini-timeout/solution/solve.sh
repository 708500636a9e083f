#!/bin/bash
set -e
cd /app
sed -i -e 's/timeout = 30/timeout = 60/' -e 's/level = INFO/level = DEBUG/' settings.ini
