CACHE = {}


def cached(url):
    if url not in CACHE:
        CACHE[url] = fetch_data (url)
    return CACHE[url]
