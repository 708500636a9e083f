#!/bin/bash
set -e
cd /app
sed -i 's/greeting="Goodbye"/greeting="Hello"/' greetings.py
