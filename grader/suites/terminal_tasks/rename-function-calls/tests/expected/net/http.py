def fetch_data(url, retries=3):
    """Fetch one URL."""
    return ("GET", url, retries)


def old_fetch_all(urls):
    return [fetch_data(u) for u in urls]


def bold_fetch(url):
    return fetch_data(url).upper()
