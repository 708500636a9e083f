#!/bin/bash
set -e
cd /app
sed -i -e 's/"port": 5000/"port": 8080/' -e 's/"debug": true/"debug": false/' config.json
