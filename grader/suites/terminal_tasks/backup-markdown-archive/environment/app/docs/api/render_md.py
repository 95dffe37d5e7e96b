print("md")
