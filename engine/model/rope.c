/* RoPE frequency tables, computed the way transformers'
 * compute_default_rope_parameters and _compute_yarn_parameters do: in
 * float32, with YaRN's correction range from double-precision logs rounded
 * outward (floor/ceil: transformers reads `truncate` from the top-level
 * rope_parameters, where V4's nested layout never has it, so it is always
 * on). */
#include <math.h>

#include "model_internal.h"

void v4_rope_inv_freq(const v4_rope *r, int dim, float *inv)
{
    int np = dim / 2;
    float base = (float)r->theta;
    double low = 0, high = 0;
    if (r->yarn) {
        double lb = 2 * log(r->theta);
        low = floor(dim * log(r->original_max_pos / (r->beta_fast * 2 * M_PI)) / lb);
        high = ceil(dim * log(r->original_max_pos / (r->beta_slow * 2 * M_PI)) / lb);
        if (low < 0) low = 0;
        if (high > dim - 1) high = dim - 1;
        if (low == high) high += 0.001;
    }
    for (int i = 0; i < np; i++) {
        float pf = powf(base, (float)(2 * i) / (float)dim);
        float extra = 1.0f / pf;
        if (!r->yarn) { inv[i] = extra; continue; }
        float inter = 1.0f / ((float)r->factor * pf);
        float ramp = ((float)i - (float)low) / (float)(high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float ef = 1.0f - ramp;
        inv[i] = inter * (1.0f - ef) + extra * ef;
    }
}
