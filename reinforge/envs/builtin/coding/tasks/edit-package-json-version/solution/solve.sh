#!/bin/bash
set -e
cd /app
sed -i 's/"version": "1.0.0"/"version": "1.1.0"/' package.json
