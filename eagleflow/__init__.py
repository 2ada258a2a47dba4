"""eagleflow: prompts to a working EAGLE-3 drafter, as a Snakemake workflow."""
