#!/bin/bash
set -e
cd /app
echo 'ship it' >> todo.txt
