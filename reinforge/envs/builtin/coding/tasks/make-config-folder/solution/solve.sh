#!/bin/bash
set -e
cd /app
mkdir -p config
echo '{"theme": "dark", "font_size": 14}' > config/settings.json
