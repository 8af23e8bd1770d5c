/* The DiT block library: what every diffusion transformer shares, model-neutral.
 * Today: the feasibility of a tensor/context-parallel split (Difflet §4) for a
 * transformer with `heads` attention heads. */
#include <stdio.h>

#include "models/models_impl.h"

const char *dl_dit_split_check(const dl_dit_split *sp, int64_t heads, char *buf, size_t n) {
    if (sp->tp < 1 || sp->cp < 1) return "parallel degrees must be at least 1";
    if (sp->tp_rank < 0 || sp->tp_rank >= sp->tp || sp->cp_rank < 0 || sp->cp_rank >= sp->cp)
        return "a rank's place is outside its group";
    if (sp->sp && sp->tp < 2) return "sequence parallelism runs on the TP group: it needs tp >= 2";
    if (heads % sp->tp) {
        snprintf(buf, n, "the model's %lld attention heads are not divisible by tp=%d", (long long)heads, sp->tp);
        return buf;
    }
    if (sp->cp > 1 && sp->cp_mode == DL_CP_ULYSSES && heads % (sp->tp * sp->cp)) {
        snprintf(buf, n, "the model's %lld attention heads are not divisible by tp x cp = %d (Ulysses gives every cp rank whole heads of each tp rank's share)",
                 (long long)heads, sp->tp * sp->cp);
        return buf;
    }
    return NULL;
}


const char *dl_cp_mode_name(dl_cp_mode m) { return m == DL_CP_RING ? "ring" : m == DL_CP_GATHER ? "gather" : "ulysses"; }
