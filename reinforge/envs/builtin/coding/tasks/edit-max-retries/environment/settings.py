"""Settings of the downloader."""

MAX_RETRIES = 3
TIMEOUT_SECONDS = 30
USER_AGENT = "downloader/1.0"
