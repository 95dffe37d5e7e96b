def get_item(item_id):
    # FIXME: validate item_id
    return {"id": item_id}


def delete_item(item_id):
    # TODO: check permissions
    # TODO: soft delete instead
    return None
