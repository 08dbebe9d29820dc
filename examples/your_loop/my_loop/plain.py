"""The loop as you may have it today: one process, plain PyTorch, scikit-learn's digits.

    python -m my_loop.plain

``my_loop/train.py`` is the same loop as trainflow runs it; the lines that change are marked
there.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from my_loop.nets import build


def main(lr: float = 3e-3, batch_size: int = 64, max_epochs: int = 5) -> None:
    torch.manual_seed(0)
    x, y = load_digits(return_X_y=True)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.2, random_state=0)
    train = torch.utils.data.TensorDataset(
        torch.tensor(x_train, dtype=torch.float32), torch.tensor(y_train)
    )
    spec = SimpleNamespace(input_shape=[x.shape[1]], num_outputs=10)
    model = build(spec, width=64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)  # your own loss
    for epoch in range(max_epochs):
        model.train()
        for features, label in torch.utils.data.DataLoader(train, batch_size, shuffle=True):
            optimizer.zero_grad()
            loss = loss_fn(model(features), label)
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            predicted = model(torch.tensor(x_val, dtype=torch.float32)).argmax(1)
        accuracy = (predicted == torch.tensor(y_val)).float().mean().item()
        print(f"epoch {epoch + 1}: loss {loss.item():.4f}, val_accuracy {accuracy:.4f}")
        torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
