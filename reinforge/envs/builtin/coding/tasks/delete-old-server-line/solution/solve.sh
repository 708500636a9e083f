#!/bin/bash
set -e
cd /app
sed -i '/^old-server$/d' servers.txt
