from lib.net.http import fetch_data, old_fetch_all


def load(url):
    data = fetch_data(url)
    return data


def load_many(urls):
    return old_fetch_all(urls)
