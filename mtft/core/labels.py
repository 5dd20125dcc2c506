"""The one marker of "no label here", shared by heads, tasks, the batch builder and the masked-LM loss.

-100 is what PyTorch's ``cross_entropy`` ignores by default and what Hugging Face's collators write.
"""

IGNORE_INDEX = -100
