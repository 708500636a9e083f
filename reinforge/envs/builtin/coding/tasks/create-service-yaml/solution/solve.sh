#!/bin/bash
set -e
cd /app
printf 'name: api\nport: 8443\n' > service.yaml
