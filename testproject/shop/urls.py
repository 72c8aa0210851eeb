from django.urls import path

from . import views

app_name = "shop"
urlpatterns = [
    path("buy/<int:product_id>/", views.buy, name="buy"),
    path("product/<int:product_id>/", views.product, name="product"),
    path("p/<int:product_id>/", views.product_page, name="product-page"),
]
