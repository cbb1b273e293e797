from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "portal.accounts"
    label = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Connects the sign-in lockout's signal receivers (user_login_failed, user_logged_in)
        # and mirrors every admin action into the audit log; drops cached API tokens on change.
        from portal import security
        from portal.accounts import authentication

        security.admin_audit_connect()
        authentication.token_cache_connect()
