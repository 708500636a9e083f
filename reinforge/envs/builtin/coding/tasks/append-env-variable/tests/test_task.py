import unittest


class LocalEnv(unittest.TestCase):
    def test_content(self):
        with open("/app/local.env", "rb") as f:
            content = f.read()
        expected = b"DB_HOST=localhost\nDB_PORT=5432\nDB_NAME=shop"
        self.assertIn(content, (expected, expected + b"\n"))


if __name__ == "__main__":
    unittest.main()
