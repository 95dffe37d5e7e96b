"""photos holds exactly the lowercased, underscored names, each with its original contents."""
import os
import sys

ORIGINAL = ["Beach Day.JPG", "My Cat.jpeg", "IMG 001.PNG", "Notes FINAL.txt", "already_fine.png",
            "Trip To Rome 2023.Jpg", "SUNSET.jpg"]
EXPECTED = {name.lower().replace(" ", "_"): f"original name: {name}\n" for name in ORIGINAL}

names = set(os.listdir("/app/photos"))
if names != set(EXPECTED):
    print(f"FAIL: photos contains {sorted(names)}, expected {sorted(EXPECTED)}")
    sys.exit(1)
for name, content in EXPECTED.items():
    with open(os.path.join("/app/photos", name)) as f:
        if f.read() != content:
            print(f"FAIL: {name} does not hold the contents of the original file")
            sys.exit(1)
print("OK")
