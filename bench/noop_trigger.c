/*
 * A row trigger that does nothing: the least any BEFORE ROW trigger costs,
 * the ceiling a guarded UPDATE is measured against (bench/guarded.py). Built
 * by the bench into its work directory and loaded from there; never
 * installed.
 */
#include "postgres.h"

#include "commands/trigger.h"
#include "fmgr.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(bench_noop_trigger);

Datum
bench_noop_trigger(PG_FUNCTION_ARGS)
{
	TriggerData *td = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		elog(ERROR, "bench_noop_trigger: not called as a trigger");
	return PointerGetDatum(TRIGGER_FIRED_BY_UPDATE(td->tg_event) ? td->tg_newtuple : td->tg_trigtuple);
}
