#!/bin/bash
set -e
cd /app
sed -i 's/APP_ENV=development/APP_ENV=production/' app.env
