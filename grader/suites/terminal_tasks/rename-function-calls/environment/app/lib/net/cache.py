CACHE = {}


def cached(url):
    if url not in CACHE:
        CACHE[url] = old_fetch (url)
    return CACHE[url]
