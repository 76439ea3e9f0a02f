"""Verification tools: FP check campaigns (fpcheck, fpvectors), the Berkeley SoftFloat reference (softfloat_ref),
formal proofs by SAT k-induction (formal)."""
