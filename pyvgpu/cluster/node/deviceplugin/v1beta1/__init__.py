"""v1beta1: api.proto (written from the published API) and its generated stubs."""
