from rest_framework.pagination import CursorPagination as _CursorPagination


class CursorPagination(_CursorPagination):
    page_size = 50
    max_page_size = 200
    page_size_query_param = "page_size"
    ordering = "-id"
