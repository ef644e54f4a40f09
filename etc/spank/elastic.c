/*
 * slurm-elastic's SPANK plugin: the --elastic[=SPEC] option of sbatch, salloc and srun.
 *
 * It only makes the option exist (listed in --help, usable in #SBATCH lines).  It does not
 * read SPEC: Slurm forwards an option of the allocator context to slurmctld in the job's
 * spank_job_env as _SLURM_SPANK_OPTION_elastic_elastic=<SPEC> ("(null)" without one), and
 * etc/job_submit.lua turns that into the job's elastic marker with the marker's own rules
 * and messages, so the grammar lives in one place on the submission side.
 *
 * Build and install: scripts/build-spank.sh (docs/admin-guide.md, "The --elastic option").
 */
#include <slurm/spank.h>

SPANK_PLUGIN(elastic, 1);

static int accept_elastic(int val, const char *optarg, int remote)
{
	(void) val;
	(void) optarg;
	(void) remote;
	return ESPANK_SUCCESS;
}

static struct spank_option elastic_option = {
	"elastic",
	"[SPEC]",
	"Let slurm-elastic resize this job within its node range. SPEC: MIN-MAX "
	"(sets --nodes), marker keys (min=1,max=4,step=2,gpus=4,cost=30) or both "
	"(2-8:step=2); without SPEC the job's --nodes range.",
	2, /* the argument is optional */
	0,
	accept_elastic,
};

/*
 * Registered from slurm_spank_init rather than a static spank_options table: with the
 * table, Slurm 22.05's sbatch said "unrecognized option '--elastic'" (srun had it).
 * Registered wherever a job is submitted or its tasks start, so a step's remote side
 * knows the option its allocation was given.
 */
int slurm_spank_init(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	switch (spank_context()) {
	case S_CTX_ALLOCATOR:
	case S_CTX_LOCAL:
	case S_CTX_REMOTE:
		return spank_option_register(sp, &elastic_option);
	default:
		return ESPANK_SUCCESS;
	}
}
