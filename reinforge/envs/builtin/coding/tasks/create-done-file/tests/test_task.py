import unittest


class NotesFile(unittest.TestCase):
    def test_content(self):
        with open("/app/notes.txt", "rb") as f:
            self.assertIn(f.read(), (b"done", b"done\n"))


if __name__ == "__main__":
    unittest.main()
