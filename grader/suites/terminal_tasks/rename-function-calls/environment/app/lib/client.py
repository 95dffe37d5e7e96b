from lib.net.http import old_fetch, old_fetch_all


def load(url):
    data = old_fetch(url)
    return data


def load_many(urls):
    return old_fetch_all(urls)
