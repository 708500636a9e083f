#!/bin/bash
set -e
cd /app
sed -i 's/"debug": false/"debug": true/' config.json
