#!/bin/bash
set -e
cd /app
grep -v '^API_TOKEN=' service.env > service.env.new
mv service.env.new service.env
