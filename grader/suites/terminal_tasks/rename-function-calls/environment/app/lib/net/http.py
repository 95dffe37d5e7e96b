def old_fetch(url, retries=3):
    """Fetch one URL."""
    return ("GET", url, retries)


def old_fetch_all(urls):
    return [old_fetch(u) for u in urls]


def bold_fetch(url):
    return old_fetch(url).upper()
