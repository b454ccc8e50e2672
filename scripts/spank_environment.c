/*
 * A SPANK plugin for the local test cluster that registers the `--environment`
 * option of CSCS's container engine, so that scripts written for Alps
 * (`#SBATCH --environment=<name|path.toml>`) are accepted by sbatch here exactly
 * as they are there. The container itself is not emulated: the option is
 * validated (it must not be empty) and recorded in the job's environment as
 * SWEEP_CONTAINER_ENVIRONMENT, nothing more.
 */
#include <slurm/spank.h>
#include <string.h>

SPANK_PLUGIN(environment, 1);

static char environment[4096];

static int environment_cb(int val, const char *optarg, int remote)
{
    (void)val;
    (void)remote;
    if (optarg == NULL || optarg[0] == '\0') {
        slurm_error("--environment needs a container environment name or .toml path");
        return -1;
    }
    strncpy(environment, optarg, sizeof(environment) - 1);
    return 0;
}

static struct spank_option environment_option = {
    "environment", "name|path",
    "Container environment (CSCS container engine; accepted and ignored on this local cluster)",
    1, 0, (spank_opt_cb_f)environment_cb};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    return spank_option_register(sp, &environment_option) == ESPANK_SUCCESS ? 0 : -1;
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    if (environment[0] != '\0')
        spank_setenv(sp, "SWEEP_CONTAINER_ENVIRONMENT", environment, 1);
    return 0;
}
