#!/bin/bash
set -e
cd /app
printf 'ship it\n' >> todo.txt
