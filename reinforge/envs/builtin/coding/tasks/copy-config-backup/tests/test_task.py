import os
import unittest

ORIGINAL = b"server {\n    listen 80;\n    server_name example.local;\n    root /var/www/html;\n}\n"


class Backup(unittest.TestCase):
    def test_both_files(self):
        for path in ("/app/nginx.conf", "/app/nginx.conf.bak"):
            self.assertFalse(os.path.islink(path), path)
            with open(path, "rb") as f:
                self.assertEqual(f.read(), ORIGINAL, path)


if __name__ == "__main__":
    unittest.main()
