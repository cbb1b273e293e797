"""Projects and the signed-in user."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, permissions, serializers
from rest_framework.authtoken.models import Token
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.accounts import selectors as account_selectors
from portal.accounts import services as account_services
from portal.accounts.models import Membership
from portal.security import LOCKED_OUT_MESSAGE, ScopedRateThrottle, client_ip, is_locked_out
from scheduling.api.common import PaginatedApi, errors, request_user


class QuotaSerializer(serializers.Serializer[Any]):
    gpu_type = serializers.CharField(source="gpu_type.name")
    guaranteed_gpus = serializers.IntegerField()
    borrow_limit_gpus = serializers.IntegerField(allow_null=True)


class ProjectOutputSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    slug = serializers.SlugField()
    description = serializers.CharField()
    fair_share_weight = serializers.FloatField()
    is_active = serializers.BooleanField()
    my_role = serializers.ChoiceField(choices=Membership.Role.choices, allow_null=True)
    quotas = QuotaSerializer(many=True)


class ProjectListApi(PaginatedApi):
    OutputSerializer = ProjectOutputSerializer

    @extend_schema(
        operation_id="projects_list", responses={200: OutputSerializer(many=True), **errors(400, 401)}
    )
    def get(self, request: Request) -> Response:
        return self.paginate(request, account_selectors.project_list(request.user), self.OutputSerializer)


class ProjectDetailApi(APIView):
    @extend_schema(
        operation_id="projects_retrieve", responses={200: ProjectOutputSerializer, **errors(401, 404)}
    )
    def get(self, request: Request, slug: str) -> Response:
        project = account_selectors.project_get(request.user, slug=slug)
        return Response(ProjectOutputSerializer(project).data)


class MembershipSerializer(serializers.Serializer[Any]):
    project = serializers.SlugField(source="project.slug")
    project_name = serializers.CharField(source="project.name")
    role = serializers.ChoiceField(choices=Membership.Role.choices)


class MeApi(APIView):
    class OutputSerializer(serializers.Serializer[Any]):
        id = serializers.IntegerField()
        username = serializers.CharField()
        email = serializers.CharField(allow_blank=True)
        is_staff = serializers.BooleanField()
        memberships = MembershipSerializer(many=True)

    @extend_schema(operation_id="me_retrieve", responses={200: OutputSerializer, **errors(401)})
    def get(self, request: Request) -> Response:
        user = request.user
        data = {
            "id": user.pk,
            "username": user.get_username(),
            "email": getattr(user, "email", ""),
            "is_staff": user.is_staff,
            "memberships": account_selectors.membership_list(user),
        }
        return Response(self.OutputSerializer(data).data)


class TokenCreateApi(APIView):
    """Exchange a username and password for the user's API token (created on first use).

    No session or token is needed (scripts start here), so no CSRF either; attempts are
    throttled per client address.
    """

    authentication_classes: list[Any] = []
    permission_classes = [permissions.AllowAny]
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth-token"

    class InputSerializer(serializers.Serializer[Any]):
        username = serializers.CharField(max_length=150)
        password = serializers.CharField(
            max_length=4096, trim_whitespace=False, style={"input_type": "password"}
        )

    class OutputSerializer(serializers.Serializer[Any]):
        token = serializers.CharField()

    @extend_schema(
        operation_id="auth_token_create",
        auth=[],
        request=InputSerializer,
        responses={200: OutputSerializer, **errors(400, 403, 413, 429)},
    )
    def post(self, request: Request) -> Response:
        username = request.data.get("username") if isinstance(request.data, dict) else None
        # Locked before this attempt: say so (403), not "wrong password".
        was_locked = (
            isinstance(username, str) and bool(username) and is_locked_out(username, client_ip(request))
        )
        credentials = AuthTokenSerializer(data=request.data, context={"request": request})
        if not credentials.is_valid():
            if was_locked:
                raise exceptions.PermissionDenied(LOCKED_OUT_MESSAGE)
            raise exceptions.ValidationError(credentials.errors)
        token, _ = Token.objects.get_or_create(user=credentials.validated_data["user"])
        return Response(self.OutputSerializer({"token": token.key}).data)


class TokenRevokeApi(APIView):
    """Revoke the caller's API token at once (sign in again with POST /api/v1/auth/token/)."""

    @extend_schema(operation_id="me_token_destroy", request=None, responses={204: None, **errors(401, 429)})
    def delete(self, request: Request) -> Response:
        account_services.token_revoke(user=request_user(request))
        return Response(status=204)
