"""The Streamlit dashboard (`paretolab dashboard`): studies, frontiers, trials; it reads the stores, never writes them."""
