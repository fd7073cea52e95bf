"""HTTP routes, one APIRouter per feature; ``app.ROUTERS`` lists the modules."""
