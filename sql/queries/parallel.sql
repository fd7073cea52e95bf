-- name: parallel
-- description: The tensor/pipeline-parallel layout this rank last read (python.parallel): where it was found (DeviceMesh, Megatron, DeepSpeed pipeline, or NULL for none), the mesh dims, tp, pp and the process group's world; the data-parallel world is world / (tp x pp).
SELECT step, source, mesh, tp, pp, world, world // (tp * pp) AS dp_world
FROM python.parallel
ORDER BY step DESC
LIMIT 1
