from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "portal.accounts"
    label = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Connects the sign-in lockout's signal receivers (user_login_failed, user_logged_in).
        from portal import security  # noqa: F401
