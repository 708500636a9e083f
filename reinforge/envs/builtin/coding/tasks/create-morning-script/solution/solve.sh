#!/bin/bash
set -e
cd /app
printf '#!/bin/bash\necho "Good morning"\n' > morning.sh
