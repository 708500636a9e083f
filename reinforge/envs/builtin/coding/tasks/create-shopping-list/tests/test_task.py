import unittest


class ShoppingList(unittest.TestCase):
    def test_content(self):
        with open("/app/shopping.txt", "rb") as f:
            self.assertIn(f.read(), (b"milk\neggs\nbread\n", b"milk\neggs\nbread"))


if __name__ == "__main__":
    unittest.main()
