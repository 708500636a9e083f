import os
import unittest


class Moved(unittest.TestCase):
    def test_new_place_has_the_content(self):
        self.assertTrue(os.path.isdir("/app/docs"))
        self.assertFalse(os.path.islink("/app/docs"))
        self.assertFalse(os.path.islink("/app/docs/notes.md"))
        with open("/app/docs/notes.md", "rb") as f:
            self.assertEqual(f.read(), b"# Meeting notes\n\n- pick a date\n- book a room\n")

    def test_old_place_is_gone(self):
        self.assertFalse(os.path.lexists("/app/notes.md"))


if __name__ == "__main__":
    unittest.main()
