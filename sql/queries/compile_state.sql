-- name: compile_state
-- description: Whether each rank runs torch.compile'd code, as torch reports it (python.compile_state, the latest row): dynamo imported, frames compiled, graphs, graph breaks and the most frequent reason, recompiles and the last reason, whether the root model runs compiled and which submodules do.
-- params:
SELECT rank, step, dynamo, frames, graphs, graph_breaks, top_break, recompiles, last_recompile,
       compiled_root, compiled_modules
FROM python.compile_state
QUALIFY row_number() OVER (PARTITION BY rank ORDER BY step DESC, timestamp DESC) = 1
ORDER BY rank
